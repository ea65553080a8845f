"""Data shipped with the package: autotune caches per GPU (autotune/) and launch profiles (profiles/),
model configs for the planner (models/)."""
