"""rlmlab, decoding: greedy generation through any observation's driver, KV caches, oracles."""
