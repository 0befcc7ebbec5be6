"""DRF authentication by bearer token; reuses the credential the idempotency layer already resolved."""
from rest_framework import authentication, exceptions

from intake.credentials import credential_from_authorization


class BearerTokenAuthentication(authentication.BaseAuthentication):
    """`Authorization: Bearer <token>`; `request.user` is None, `request.auth` is the ApiCredential."""

    def authenticate(self, request):
        credential = getattr(request._request, "herald_credential", None)
        if credential is None:
            header = request.META.get("HTTP_AUTHORIZATION")
            credential = credential_from_authorization(header)
            if credential is None:
                if header:
                    raise exceptions.AuthenticationFailed("The bearer token is not valid.")
                return None
        return (None, credential)

    def authenticate_header(self, request) -> str:
        return 'Bearer realm="herald"'
