"""How the OpenAPI schema states the shape of answers that views build as plain dicts.

Some answers are built as dicts and sent as they are: the report (hundreds of nested figures, read
back from stored JSON) and the agent protocol's hot routes (rendering them through DRF serializers
would cost as much CPU as the work itself). Their serializers state the shape in the schema (every
answer has one, and the UI's TypeScript types are generated from it); they do not render. What keeps
the two true to each other is tests/platform/conftest.py, which checks every JSON answer the API tests
receive against the schema, refusing keys it does not list.
"""
from __future__ import annotations

from drf_spectacular.extensions import OpenApiAuthenticationExtension, OpenApiSerializerExtension
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

# A tensor dimension: a size, a symbolic name ("batch"), or unknown.
DIMENSION = {"oneOf": [{"type": "integer"}, {"type": "string"}], "nullable": True}
# A device target: an agent id, or a "label=value" / "agent:N" selector.
TARGET = {"oneOf": [{"type": "integer"}, {"type": "string"}]}
ANY_OBJECT = {"type": "object", "additionalProperties": {}}


class OpenSerializer(serializers.Serializer):
    """The shape of an object that lists the keys every reader may rely on and may carry more (all measured metrics, a
    runtime's own settings): the schema says `additionalProperties`, so a client generated from it keeps the rest."""


class OpenSerializerSchema(OpenApiSerializerExtension):
    target_class = OpenSerializer
    match_subclasses = True

    def map_serializer(self, auto_schema, direction):
        schema = auto_schema._map_serializer(self.target, direction, bypass_extensions=True)
        return {**schema, "additionalProperties": {}}


def json_field(shape, **kwargs) -> serializers.JSONField:
    """A JSON field rendered as stored, whose shape the schema states: a serializer (`many=True` for a list of them) or a
    schema dict. What it renders does not change. (Not read-only by default: drf-spectacular lists every read-only field as
    required, and `required=False` must say that an answer may leave it out.)"""
    field_class = extend_schema_field(shape)(type("TypedJSONField", (serializers.JSONField,), {}))
    return field_class(**kwargs)


# -- how requests authenticate ----------------------------------------------------------------------

class ApiTokenScheme(OpenApiAuthenticationExtension):
    target_class = "kiln.accounts.authentication.ApiTokenAuthentication"
    name = "apiToken"

    def get_security_definition(self, auto_schema):
        return {"type": "http", "scheme": "bearer", "description": "An API token: `Authorization: Bearer kiln_pat_…`."}


class SessionScheme(OpenApiAuthenticationExtension):
    target_class = "kiln.accounts.authentication.CsrfSessionAuthentication"
    name = "session"

    def get_security_definition(self, auto_schema):
        return {"type": "apiKey", "in": "cookie", "name": "sessionid",
                "description": "The browser's session (sign in at auth/login/); writes also send X-CSRFToken."}


class AgentTokenScheme(OpenApiAuthenticationExtension):
    target_class = "kiln.fleet.authentication.AgentTokenAuthentication"
    name = "agentToken"

    def get_security_definition(self, auto_schema):
        return {"type": "http", "scheme": "bearer", "description": "The agent token `register` returned: `Authorization: Bearer kiln_agt_…`."}
