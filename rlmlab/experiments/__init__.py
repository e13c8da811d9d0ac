"""rlmlab, experiments: splits, presets and jobs, reports, the HTML viewer."""
