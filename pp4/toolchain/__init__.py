"""The pinned compiler: locks, wheels, the provisioned prefix, its compatibility check, and which
host compilers run in what environment."""
