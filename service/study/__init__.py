"""A study's lifecycle: its trials (grid or Optuna), packed into bundles, run by Ray Tune, recorded."""
