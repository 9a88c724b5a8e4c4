"""``python -m open1b_train`` = ``open1b-train`` (the form torchrun launches)."""
import sys

from open1b_train.cli import main

sys.exit(main())
