"""Distribution: Horovod (init, allreduce, broadcast), the communication settings, the device."""
