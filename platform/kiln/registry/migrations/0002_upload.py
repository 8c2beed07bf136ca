import uuid

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("accounts", "0001_initial"),
        ("registry", "0001_initial"),
    ]

    operations = [
        migrations.CreateModel(
            name="Upload",
            fields=[
                ("id", models.UUIDField(default=uuid.uuid4, editable=False, primary_key=True, serialize=False)),
                ("owner", models.CharField(max_length=40)),
                ("filename", models.CharField(max_length=255)),
                ("length", models.BigIntegerField()),
                ("offset", models.BigIntegerField(default=0)),
                ("expected_sha256", models.CharField(blank=True, default="", max_length=64)),
                ("created_at", models.DateTimeField(auto_now_add=True)),
                ("updated_at", models.DateTimeField(auto_now=True)),
                ("expires_at", models.DateTimeField()),
                ("blob", models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name="+", to="registry.blob")),
                ("organization", models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name="uploads", to="accounts.organization")),
            ],
            options={"ordering": ["-created_at"]},
        ),
    ]
