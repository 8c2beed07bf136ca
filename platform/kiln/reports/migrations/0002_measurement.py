import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("accounts", "0001_initial"),
        ("fleet", "0001_initial"),
        ("pipeline", "0004_job_rerun_package_toolchain"),
        ("registry", "0002_upload"),
        ("reports", "0001_initial"),
    ]

    operations = [
        migrations.CreateModel(
            name="Measurement",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("model_name", models.CharField(max_length=200)),
                ("model_sha256", models.CharField(db_index=True, max_length=64)),
                ("op_histogram", models.JSONField(default=dict)),
                ("op_work", models.JSONField(default=dict)),
                ("variant_key", models.CharField(max_length=120)),
                ("variant_sha256", models.CharField(blank=True, default="", max_length=64)),
                ("precision", models.CharField(max_length=32)),
                ("recipe", models.JSONField(default=dict)),
                ("backend", models.CharField(max_length=32)),
                ("backend_version", models.CharField(blank=True, default="", max_length=64)),
                ("compile_options", models.JSONField(default=dict)),
                ("agent_name", models.CharField(max_length=120)),
                ("device_key", models.CharField(db_index=True, default="", max_length=300)),
                ("agent_version", models.CharField(blank=True, default="", max_length=64)),
                ("capabilities", models.JSONField(default=dict)),
                ("latency_ms", models.JSONField(default=dict)),
                ("p50_ms", models.FloatField()),
                ("std_ms", models.FloatField(default=0.0)),
                ("runs", models.IntegerField(default=0)),
                ("throughput_per_s", models.FloatField(null=True)),
                ("peak_memory_mb", models.FloatField(null=True)),
                ("load_ms", models.FloatField(null=True)),
                ("accuracy", models.JSONField(default=dict)),
                ("profile_by_op_type", models.JSONField(default=list)),
                ("slowdown", models.FloatField(null=True)),
                ("regression", models.BooleanField(db_index=True, default=False)),
                ("measured_at", models.DateTimeField()),
                ("agent", models.ForeignKey(null=True, on_delete=django.db.models.deletion.SET_NULL, related_name="+", to="fleet.agent")),
                ("baseline", models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name="+", to="reports.measurement")),
                ("device_task", models.OneToOneField(null=True, on_delete=django.db.models.deletion.SET_NULL, related_name="measurement", to="pipeline.devicetask")),
                ("job", models.ForeignKey(null=True, on_delete=django.db.models.deletion.SET_NULL, related_name="measurements", to="pipeline.deploymentjob")),
                ("model", models.ForeignKey(null=True, on_delete=django.db.models.deletion.SET_NULL, related_name="+", to="registry.model")),
                ("model_version", models.ForeignKey(null=True, on_delete=django.db.models.deletion.SET_NULL, related_name="+", to="registry.modelversion")),
                ("organization", models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name="measurements", to="accounts.organization")),
            ],
            options={"ordering": ["-measured_at", "-id"]},
        ),
        migrations.AddIndex(
            model_name="measurement",
            index=models.Index(fields=["organization", "model_sha256", "variant_key", "backend", "device_key"], name="measurement_series"),
        ),
    ]
