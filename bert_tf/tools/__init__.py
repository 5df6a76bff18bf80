"""Measurement and planning: the cost planner, FLOPs and peaks, profiles, machine load, the communication
study, the emulated cluster, input headroom, the speed ladder."""
