"""The S3 gateway (protocol layer): SigV4-authenticated S3 over the namespace API."""

from .server import S3Gateway

__all__ = ["S3Gateway"]
