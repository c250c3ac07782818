"""A program's steps, one kind of op a module as the kernels are grouped: each module registers its ops' kernel
makers (steps.base.kernel), and importing this package fills the registry with all of them."""

from graphir.backends.numba.steps import attention, elementwise, matmul, moe, movement, norm, recurrent, rope, vision
from graphir.backends.numba.steps.base import KERNELS, Step, kernel, step_for

__all__ = ["KERNELS", "Step", "kernel", "step_for", "attention", "elementwise", "matmul", "moe", "movement", "norm",
           "recurrent", "rope", "vision"]
