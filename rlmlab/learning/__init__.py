"""rlmlab, learning: observations, learners, training views and packing, the model, training, checkpoints, configs."""
