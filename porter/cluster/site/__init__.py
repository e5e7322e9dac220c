"""What a site is and how training starts there.

- :mod:`.profiles`: site profiles (data in ``builtin/<name>.toml``, or any TOML file with the same keys);
- :mod:`.launch`: the launch plan and scripts for Megatron-DeepSpeed on a site's nodes;
- :mod:`.preflight`: checks of a node against its site profile before a job starts;
"""
