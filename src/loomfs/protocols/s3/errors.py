"""S3 errors (protocol layer): the one table from loomfs errors to S3 codes, and the XML.

A namespace error is translated once, here, into the S3 code a client expects for the
operation's subject (a missing key is NoSuchKey, a missing bucket NoSuchBucket); errors
that exist only in S3 (signatures, XML, multipart) are raised as ``S3Error`` directly.
"""

from __future__ import annotations

from collections.abc import Mapping
from xml.sax.saxutils import escape

from ...errors import (
    AlreadyExists,
    AuthenticationFailed,
    BackendUnavailable,
    Conflict,
    CrossesVolume,
    DirectoryNotEmpty,
    InsufficientStorage,
    InvalidArgument,
    InvalidPath,
    IsADirectory,
    KeyRequired,
    LoomError,
    NotADirectory,
    NotFound,
    NotSupported,
    PermissionDenied,
    RangeNotSatisfiable,
    WrongKey,
)

# HTTP status of every S3 code this gateway answers with
STATUS: dict[str, int] = {
    "AccessDenied": 403,
    "AccessForbidden": 403,
    "AuthorizationHeaderMalformed": 400,
    "AuthorizationQueryParametersError": 400,
    "BadDigest": 400,
    "BadRequest": 400,
    "BucketAlreadyExists": 409,
    "BucketAlreadyOwnedByYou": 409,
    "BucketNotEmpty": 409,
    "EntityTooLarge": 400,
    "EntityTooSmall": 400,
    "IncompleteBody": 400,
    "InternalError": 500,
    "InvalidAccessKeyId": 403,
    "InvalidArgument": 400,
    "InvalidBucketName": 400,
    "InvalidDigest": 400,
    "InvalidPart": 400,
    "InvalidPolicyDocument": 400,
    "InvalidPartOrder": 400,
    "InvalidRange": 416,
    "InvalidRequest": 400,
    "InvalidBucketState": 409,
    "InvalidTag": 400,
    "KeyTooLongError": 400,
    "MalformedACLError": 400,
    "MalformedPolicy": 400,
    "MalformedPOSTRequest": 400,
    "MalformedXML": 400,
    "MethodNotAllowed": 405,
    "MissingContentLength": 411,
    "NoSuchBucket": 404,
    "NoSuchBucketPolicy": 404,
    "NoSuchCORSConfiguration": 404,
    "NoSuchKey": 404,
    "NoSuchLifecycleConfiguration": 404,
    "NoSuchPublicAccessBlockConfiguration": 404,
    "NoSuchTagSet": 404,
    "NoSuchUpload": 404,
    "NoSuchVersion": 404,
    "NoSuchWebsiteConfiguration": 404,
    "ObjectLockConfigurationNotFoundError": 404,
    "OwnershipControlsNotFoundError": 404,
    "ReplicationConfigurationNotFoundError": 404,
    "ServerSideEncryptionConfigurationNotFoundError": 404,
    "NotImplemented": 501,
    "OperationAborted": 409,
    "PreconditionFailed": 412,
    "RequestTimeTooSkewed": 403,
    "ServiceUnavailable": 503,
    "SignatureDoesNotMatch": 403,
    "XAmzContentSHA256Mismatch": 400,
    "NotModified": 304,
    "XMinioStorageFull": 507,
}

# The one table from the loomfs hierarchy to S3 codes; subclasses not listed use their
# base's. NotFound depends on the subject, see ``from_loom``.
CODES: dict[type[LoomError], str] = {
    NotFound: "NoSuchKey",
    AlreadyExists: "PreconditionFailed",
    # a key where the tree has a directory, or below an object: S3 has no such conflict
    NotADirectory: "InvalidRequest",
    IsADirectory: "InvalidRequest",
    DirectoryNotEmpty: "BucketNotEmpty",
    CrossesVolume: "NotImplemented",
    Conflict: "PreconditionFailed",
    AuthenticationFailed: "AccessDenied",
    PermissionDenied: "AccessDenied",
    # SSE-C: no key, or not the object's (400 as RGW and the s3-tests suite have it)
    KeyRequired: "InvalidRequest",
    WrongKey: "InvalidRequest",
    RangeNotSatisfiable: "InvalidRange",
    InvalidPath: "InvalidArgument",
    InvalidArgument: "InvalidArgument",
    NotSupported: "NotImplemented",
    # A full disk stays full until someone frees space: not 503 (ServiceUnavailable),
    # which SDKs retry (botocore: 500, 502, 503, 504, 509) for seconds before failing.
    # AWS has no such error; MinIO's code and status are the ones S3 clients and tools
    # already know, and 507 is in no SDK's retry list.
    InsufficientStorage: "XMinioStorageFull",
    BackendUnavailable: "ServiceUnavailable",
    LoomError: "InternalError",
}


class S3Error(Exception):
    def __init__(
        self,
        code: str,
        message: str,
        *,
        resource: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        """``headers``: answered with the error (a delete marker's x-amz-delete-marker)."""
        super().__init__(message)
        self.code = code
        self.message = message
        self.resource = resource
        self.headers = dict(headers or {})

    @property
    def status(self) -> int:
        return STATUS.get(self.code, 400)


def from_loom(exc: LoomError, resource: str, *, missing: str = "NoSuchKey") -> S3Error:
    """The S3 error for a namespace error; ``missing`` names what a NotFound means here."""
    code = "InternalError"
    for cls in type(exc).__mro__:
        if cls in CODES:
            code = CODES[cls]
            break
    if code == "NoSuchKey":
        code = missing
    message = "internal error, see the server log" if code == "InternalError" else exc.message
    error = S3Error(code, message, resource=resource)
    error.__cause__ = exc
    return error


def error_xml(error: S3Error, request_id: str) -> bytes:
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n<Error>'
        f"<Code>{error.code}</Code><Message>{escape(error.message)}</Message>"
        f"<Resource>{escape(error.resource or '')}</Resource>"
        f"<RequestId>{request_id}</RequestId></Error>"
    ).encode()
