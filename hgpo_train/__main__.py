"""``python -m hgpo_train``: the trainer's command line (:mod:`hgpo_train.cli`)."""

import sys

from hgpo_train.cli import main

if __name__ == "__main__":
    sys.exit(main())
