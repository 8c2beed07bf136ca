import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("accounts", "0001_initial"), ("reports", "0002_measurement")]

    operations = [
        migrations.CreateModel(
            name="PackageKey",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("key_id", models.CharField(max_length=32)),
                ("wrapped_key", models.TextField()),
                ("created_at", models.DateTimeField(auto_now_add=True)),
                ("organization", models.OneToOneField(on_delete=django.db.models.deletion.CASCADE, related_name="package_key", to="accounts.organization")),
            ],
        ),
    ]
