"""Permission: the request carries a live API credential (there are no user accounts on the API)."""
from rest_framework.permissions import BasePermission


class HasCredential(BasePermission):
    def has_permission(self, request, view) -> bool:
        return request.auth is not None
