"""rlmlab, measuring: scores, the one teacher-forced pass, the invariance probe, frame errors, statistics."""
