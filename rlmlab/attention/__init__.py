"""rlmlab, attention: who attends to whom and at which positions, for training and decoding alike.

`layout` says which positions each position may see (packed examples, RM's lanes, the decoder's
rows); `backends` computes attention under a layout (dense, by blocks, one cached decoding step;
FlexAttention, the CUDA path, in `flex`) and `attention_kind` picks one for a device; `positions` encodes a position index
(learned, none, RoPE, ALiBi) whose names are in `encodings`; `position_index` says where each
token's index counts from (the trace's start or the active frame's). Depends only on `task`.
"""
