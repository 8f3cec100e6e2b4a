"""Stage: results.  Fixed paths, atomic per-point writes, and loading back for analysis."""
