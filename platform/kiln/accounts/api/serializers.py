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
        read_only_fields = fields

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
        read_only_fields = fields


class MembershipCreateSerializer(serializers.Serializer):
    username = serializers.CharField(max_length=150)
    role = serializers.ChoiceField(choices=Role.choices, default=Role.MEMBER)


class MembershipRoleSerializer(serializers.Serializer):
    role = serializers.ChoiceField(choices=Role.choices)


# -- answers built as dicts (their shape in the schema, kiln.core.schema) -----------------------------------

class CsrfSerializer(serializers.Serializer):
    csrf_token = serializers.CharField()


class UserSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    username = serializers.CharField()


class OrganizationSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    name = serializers.CharField()
    slug = serializers.CharField()
    role = serializers.ChoiceField(choices=Role.choices, help_text="The signed-in user's role in it.")


class MeSerializer(serializers.Serializer):
    """Who is signed in, the organization requests act in, and every organization they belong to."""

    user = UserSerializer()
    organization = OrganizationSerializer(allow_null=True)
    organizations = OrganizationSerializer(many=True)


class ApiTokenCreatedSerializer(ApiTokenSerializer):
    """A new API token: the secret, shown once."""

    token = serializers.CharField(read_only=True, help_text="kiln_pat_…, shown once.")

    class Meta(ApiTokenSerializer.Meta):
        fields = [*ApiTokenSerializer.Meta.fields, "token"]
        read_only_fields = fields
