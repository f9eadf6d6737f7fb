# A page of the API reference (scripts/api_docs.sh): the guide ../audit.md, included by pdoc.
"""
.. include:: ../audit.md
"""
