from rest_framework import serializers

from kiln.core.fields import id_field

from ..models import ApiToken, Membership, Role


class LoginSerializer(serializers.Serializer):
    username = serializers.CharField()
    password = serializers.CharField(trim_whitespace=False)


class SignupSerializer(LoginSerializer):
    organization = serializers.CharField(max_length=120)


class OrganizationChoiceSerializer(serializers.Serializer):
    organization = id_field()


class ApiTokenSerializer(serializers.ModelSerializer):
    prefix = serializers.SerializerMethodField()
    revoked = serializers.SerializerMethodField()

    class Meta:
        model = ApiToken
        fields = ["id", "name", "prefix", "created_at", "expires_at", "last_used_at", "revoked", "created_by_token"]

    def get_prefix(self, token) -> str:
        return f"kiln_pat_{token.lookup_prefix}"

    def get_revoked(self, token) -> bool:
        return token.revoked_at is not None


class ApiTokenCreateSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=120)
    expires_in_days = serializers.IntegerField(required=False, allow_null=True, min_value=1, max_value=3650)


class MembershipSerializer(serializers.ModelSerializer):
    username = serializers.CharField(source="user.username", read_only=True)
    user = serializers.IntegerField(source="user_id", read_only=True)

    class Meta:
        model = Membership
        fields = ["id", "user", "username", "role", "created_at"]


class MembershipCreateSerializer(serializers.Serializer):
    username = serializers.CharField(max_length=150)
    role = serializers.ChoiceField(choices=Role.values, default=Role.MEMBER)


class MembershipRoleSerializer(serializers.Serializer):
    role = serializers.ChoiceField(choices=Role.values)
