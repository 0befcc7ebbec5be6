"""Admin for API credentials (issued by a service, token shown once) and read-only idempotency keys."""
from django.contrib import admin, messages
from django.db.models.functions import Length
from django.template.response import TemplateResponse
from django.utils.translation import ngettext

from intake.credentials import credential_issue, credentials_revoke
from intake.models import ApiCredential, IdempotencyKey
from webhooks.admin import CappedCountPaginator


@admin.register(ApiCredential)
class ApiCredentialAdmin(admin.ModelAdmin):
    """Add = pick a tenant (none: a platform credential, SPEC §10) and a name; the token is generated, shown
    once on the page that answers the add, stored hashed."""

    list_display = ("kind", "tenant", "tenant_uid", "name", "token_prefix", "created_at", "revoked_at")
    list_display_links = ("token_prefix",)
    list_filter = ("kind", "tenant")
    list_select_related = ("tenant",)
    search_fields = ("name", "token_prefix", "tenant__name")
    autocomplete_fields = ("tenant",)
    actions = ["revoke"]

    # token_hash appears in none of these: it is never shown nor editable.
    def get_fields(self, request, obj=None):
        if obj is None:
            return ("tenant", "name")
        return ("kind", "tenant", "tenant_uid", "name", "token_prefix", "created_at", "revoked_at")

    def get_readonly_fields(self, request, obj=None):
        return () if obj is None else ("kind", "tenant", "tenant_uid", "token_prefix", "created_at", "revoked_at")

    def get_form(self, request, obj=None, **kwargs):
        form = super().get_form(request, obj, **kwargs)
        if obj is None and "tenant" in form.base_fields:
            form.base_fields["tenant"].help_text = "Leave empty for a platform credential, which manages every tenant."
        return form

    @admin.display(description="tenant uid")
    def tenant_uid(self, credential: ApiCredential) -> str:
        return (credential.tenant.uid or "—") if credential.tenant_id else "—"

    def get_queryset(self, request):
        return super().get_queryset(request).select_related("tenant")

    def has_delete_permission(self, request, obj=None):
        return False  # revoke instead: the credential's idempotency keys and history stay

    def save_model(self, request, obj, form, change):
        if change:
            super().save_model(request, obj, form, change)  # only the name can change
            return
        credential, token = credential_issue(tenant=form.cleaned_data["tenant"], name=form.cleaned_data["name"])
        for field in ApiCredential._meta.concrete_fields:
            setattr(obj, field.attname, getattr(credential, field.attname))
        obj._state.adding = False
        request.herald_issued_token = token

    def response_add(self, request, obj, post_url_continue=None):
        """The new token on a page of its own, answered to the POST itself (no redirect): a message would
        carry it in Django's `messages` cookie (signed, not encrypted) or the session table."""
        token = getattr(request, "herald_issued_token", None)
        if token is None:
            return super().response_add(request, obj, post_url_continue)
        # (the admin's views are never cached: the page is answered with Cache-Control no-store)
        return TemplateResponse(request, "admin/intake/apicredential/token_issued.html", {
            **self.admin_site.each_context(request), "opts": self.opts, "credential": obj, "token": token})

    @admin.action(description="Revoke selected credentials", permissions=["change"])
    def revoke(self, request, queryset):
        revoked = credentials_revoke(credential_ids=list(queryset.values_list("pk", flat=True)))
        self.message_user(request, ngettext("Revoked %(count)d credential.", "Revoked %(count)d credentials.",
                                            revoked) % {"count": revoked}, messages.SUCCESS)


@admin.register(IdempotencyKey)
class IdempotencyKeyAdmin(admin.ModelAdmin):
    """Strictly read-only: the keys are the intake's record; only the middleware and beat write them."""

    list_display = ("credential", "key", "response_status", "created_at", "expires_at")
    list_display_links = ("key",)
    list_filter = ("response_status",)
    list_select_related = ("credential__tenant",)
    search_fields = ("key__exact",)
    search_help_text = "An exact Idempotency-Key."
    show_full_result_count = False
    paginator = CappedCountPaginator  # a day of keys can be millions: the list never counts them all
    # Not the stored response body (the tenant's data): only its size.
    fields = ("credential", "key", "method", "path", "fingerprint", "response_status", "response_headers",
              "response_body_size", "response_encrypted", "created_at", "expires_at")
    readonly_fields = fields

    def get_queryset(self, request):
        return (super().get_queryset(request).select_related("credential__tenant").defer("response_body")
                .annotate(response_body_length=Length("response_body")))

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    @admin.display(description="response body")
    def response_body_size(self, key: IdempotencyKey) -> str:
        length = key.response_body_length
        return "—" if length is None else f"{length} bytes (not shown)"
