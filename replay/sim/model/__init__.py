"""The pure cache model: slots, live KV, disk checkpoints and ds4's policy, in virtual time (compiled with mypyc)."""
