from django.contrib import admin

from .models import ApiToken, Membership, Organization

admin.site.register(Organization)
admin.site.register(Membership)


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = ["name", "user", "organization", "lookup_prefix", "created_at", "expires_at", "revoked_at"]
    readonly_fields = ["digest", "lookup_prefix"]
