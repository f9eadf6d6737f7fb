# A page of the API reference (scripts/api_docs.sh): the guide ../simulate.md, included by pdoc.
"""
.. include:: ../simulate.md
"""
