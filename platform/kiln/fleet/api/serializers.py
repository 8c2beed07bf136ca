from django.conf import settings
from rest_framework import serializers

from ..models import Agent, RegistrationToken
from ..selectors import agent_current_task_id


class AgentSerializer(serializers.ModelSerializer):
    online = serializers.BooleanField(read_only=True)
    revoked = serializers.SerializerMethodField()
    current_task = serializers.SerializerMethodField()

    class Meta:
        model = Agent
        fields = ["id", "name", "labels", "capabilities", "online", "last_heartbeat_at", "current_task", "revoked", "created_at"]

    def get_revoked(self, agent) -> bool:
        return agent.revoked_at is not None

    def get_current_task(self, agent) -> int | None:
        return agent_current_task_id(agent)


class RegistrationTokenSerializer(serializers.ModelSerializer):
    prefix = serializers.SerializerMethodField()
    revoked = serializers.SerializerMethodField()
    agents = serializers.SerializerMethodField()

    class Meta:
        model = RegistrationToken
        fields = ["id", "name", "prefix", "created_at", "revoked", "agents"]

    def get_prefix(self, token) -> str:
        return f"kiln_reg_{token.lookup_prefix}"

    def get_revoked(self, token) -> bool:
        return token.revoked_at is not None

    def get_agents(self, token) -> int:
        return token.agents.count()


class RegistrationTokenCreateSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=120, required=False, default="agents")


class RegisterSerializer(serializers.Serializer):
    registration_token = serializers.CharField()
    name = serializers.CharField(max_length=120)
    labels = serializers.DictField(child=serializers.CharField(max_length=200), required=False, default=dict)
    capabilities = serializers.DictField(required=False, default=dict)


class HeartbeatSerializer(serializers.Serializer):
    capabilities = serializers.DictField(required=False, default=dict)
    running_task = serializers.IntegerField(required=False, allow_null=True, default=None)


class LeaseSerializer(serializers.Serializer):
    wait_s = serializers.FloatField(required=False, default=0, min_value=0, max_value=300)


class ProgressSerializer(serializers.Serializer):
    attempt = serializers.IntegerField(min_value=1)
    stage = serializers.CharField(max_length=32, required=False, allow_blank=True, default="")
    message = serializers.CharField(required=False, allow_blank=True, default="")
    percent = serializers.FloatField(required=False, allow_null=True, default=None)


class ResultSerializer(serializers.Serializer):
    attempt = serializers.IntegerField(min_value=1)
    # handed_back: the agent is stopping before the task's long stages; queue it again.
    status = serializers.ChoiceField(choices=["succeeded", "failed", "handed_back"])
    error = serializers.CharField(required=False, allow_blank=True, allow_null=True, default="")
    metrics = serializers.DictField(required=False, default=dict)
    accuracy = serializers.DictField(required=False, default=dict, allow_null=True)
    profile = serializers.DictField(required=False, default=dict, allow_null=True)
    log = serializers.CharField(required=False, allow_blank=True, allow_null=True, default="", trim_whitespace=False)


class ArtifactUploadSerializer(serializers.Serializer):
    """The compiled artifact: a multipart `file`, or the id of the agent's finished resumable upload."""

    attempt = serializers.IntegerField(min_value=1)
    file = serializers.FileField(required=False)
    upload = serializers.UUIDField(required=False)
    filename = serializers.CharField(max_length=255, required=False)

    def validate(self, attrs):
        if ("file" in attrs) == ("upload" in attrs):
            raise serializers.ValidationError("Send either a file (multipart) or the id of a finished upload.")
        return attrs


def agent_intervals() -> dict:
    return {
        "heartbeat_interval_s": settings.AGENT_HEARTBEAT_SECONDS,
        "poll_interval_s": settings.AGENT_POLL_SECONDS,
        "long_poll_s": settings.AGENT_LONG_POLL_SECONDS,
        "lease_seconds": settings.AGENT_LEASE_SECONDS,
    }
