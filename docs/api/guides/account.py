# A page of the API reference (scripts/api_docs.sh): the guide ../account.md, included by pdoc.
"""
.. include:: ../account.md
"""
