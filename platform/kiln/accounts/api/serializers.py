from rest_framework import serializers

from ..models import ApiToken


class LoginSerializer(serializers.Serializer):
    username = serializers.CharField()
    password = serializers.CharField(trim_whitespace=False)


class SignupSerializer(LoginSerializer):
    organization = serializers.CharField(max_length=120)


class OrganizationChoiceSerializer(serializers.Serializer):
    organization = serializers.IntegerField()


class ApiTokenSerializer(serializers.ModelSerializer):
    prefix = serializers.SerializerMethodField()
    revoked = serializers.SerializerMethodField()

    class Meta:
        model = ApiToken
        fields = ["id", "name", "prefix", "created_at", "expires_at", "last_used_at", "revoked"]

    def get_prefix(self, token) -> str:
        return f"kiln_pat_{token.lookup_prefix}"

    def get_revoked(self, token) -> bool:
        return token.revoked_at is not None


class ApiTokenCreateSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=120)
    expires_in_days = serializers.IntegerField(required=False, allow_null=True, min_value=1, max_value=3650)
