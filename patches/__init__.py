"""Shipped patch sets (data only): one folder per target project. Loaded by porter.patching."""
