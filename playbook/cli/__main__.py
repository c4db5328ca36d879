"""``python -m playbook.cli ...`` (what torchrun and Slurm lines run)."""

import sys

from playbook.cli.main import main

sys.exit(main())
