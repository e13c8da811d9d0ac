"""rlmlab, learning: observations, learners, training examples and packing, the model, training, checkpoints, configs."""
