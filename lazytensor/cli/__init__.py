"""``python -m lazytensor``: :mod:`.main` (the commands, the cache's ``info`` and
``clear``) and :mod:`.doctor` (what this machine gives each backend, how to fix what lacks).
"""
