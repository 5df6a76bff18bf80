// Forwarding header for building Horovod 0.28.1 against TensorFlow >= 2.18.
//
// horovod/tensorflow/xla_mpi_ops.cc includes the XLA builder from its old
// location; TensorFlow's wheel now ships it as xla/hlo/builder/xla_builder.h.
// scripts/setup.sh puts this folder on CPLUS_INCLUDE_PATH during the build only.
// On a CPU build the XLA custom-call ops are compiled out (#if HAVE_GPU), so
// only the include has to resolve; a GPU build uses the same forward.
#pragma once
#include "xla/hlo/builder/xla_builder.h"
