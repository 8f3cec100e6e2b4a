"""The first-principles model: roofline arithmetic, the GPU table, calibration against a study."""
