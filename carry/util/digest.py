"""sha256 without loading OpenSSL: `check` and `status` hash the patches and the upstream URL, and hashlib's import
alone (it loads libcrypto) costs them 3-4 ms. The interpreter's own sha256 gives the same digests."""

try:
    from _sha2 import sha256  # Python 3.12 and later
except ImportError:
    try:
        from _sha256 import sha256  # Python 3.11 and earlier
    except ImportError:  # an interpreter built without them
        from hashlib import sha256

__all__ = ["sha256"]
