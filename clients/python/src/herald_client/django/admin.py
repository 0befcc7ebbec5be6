"""The outbox in Django's admin (when the platform uses it): failed rows with Herald's problem, at a glance."""
from django.contrib import admin

from herald_client.django.models import OutboxMessage


@admin.register(OutboxMessage)
class OutboxMessageAdmin(admin.ModelAdmin):
    list_display = ["id", "type", "tenant", "status", "created_at", "sent_at", "event_id"]
    list_filter = ["status", "type"]
    search_fields = ["type", "tenant", "event_id"]
    readonly_fields = [field.name for field in OutboxMessage._meta.fields]
