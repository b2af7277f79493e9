"""HTTP tools: the common case of a tool that calls a provider's HTTP API.

``http_tool`` makes a :class:`~actors.tool.Tool` from an endpoint; ``credential_scope_digest``
is the credential-scope digest of its requests.
"""

from actors.http.credentials import (
    AUTH_HEADER_WORDS,
    NOT_CREDENTIAL_COOKIES,
    NOT_CREDENTIALS,
    credential_scope_digest,
)
from actors.http.tool import HttpEndpoint, http_tool

__all__ = [
    "AUTH_HEADER_WORDS",
    "NOT_CREDENTIALS",
    "NOT_CREDENTIAL_COOKIES",
    "HttpEndpoint",
    "credential_scope_digest",
    "http_tool",
]
