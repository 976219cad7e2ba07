import sys

from qvi import reproducible

# Before torch loads: a training command pins the CPU kernels' instruction set (qvi/reproducible.py).
reproducible.pin_this_process(sys.argv[1:])

from qvi.cli import main  # noqa: E402  (torch loads here)

main()
