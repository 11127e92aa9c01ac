"""The IndexFile: a hash index from ``topic#key`` to CommitLog physical offsets.

``IndexService`` owns the files of one store (``<root>/index/``); ``IndexConfig``
shapes new files; ``key_hash`` is the hash every entry stores. The on-disk format is
declared in ``mqstore.indexfile.format``.
"""

from mqstore.indexfile.config import IndexConfig
from mqstore.indexfile.format import key_hash
from mqstore.indexfile.index_service import IndexService

__all__ = ["IndexConfig", "IndexService", "key_hash"]
