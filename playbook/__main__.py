"""`python -m playbook ...` runs the same CLI as the `playbook` command (useful in a venv that is not activated)."""

import sys

from playbook.cli import main

if __name__ == "__main__":
    sys.exit(main())
