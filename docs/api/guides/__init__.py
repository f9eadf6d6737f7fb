# The guides of the API reference (scripts/api_docs.sh): a documentation-only package whose
# modules include the markdown guides of docs/api/ with pdoc's include directive.
"""
.. include:: ../README.md
"""
