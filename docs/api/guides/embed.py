# A page of the API reference (scripts/api_docs.sh): the guide ../embed.md, included by pdoc.
"""
.. include:: ../embed.md
"""
