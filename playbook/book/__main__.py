"""``python -m playbook.book``: run the chapters (with ``--execute``) and build the static book."""

import sys

from playbook.book.site import main

sys.exit(main())
