"""The static book: every chapter executed once (:mod:`~playbook.book.execute`), each live dashboard
given a kernel-free form (:mod:`~playbook.book.static`, built on :mod:`~playbook.book.grid`), each
chapter rendered as a page (:mod:`~playbook.book.render`) and the pages tied together with an index
and one copy of plotly.js (:mod:`~playbook.book.site`). ``python -m playbook.book --execute``.
"""
