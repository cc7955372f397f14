"""The one exception type of sv-kvcache."""


class KVCacheError(Exception):
    """Bad sizes, an exhausted page pool, or a page used in a way its holders do not allow."""
