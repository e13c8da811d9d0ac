"""rlmlab, experiments: splits, shortcut constructions, presets and jobs, reports, the HTML viewer."""
