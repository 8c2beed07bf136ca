import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("pipeline", "0003_package_artifacts")]

    operations = [
        migrations.AddField(
            model_name="deploymentjob",
            name="rerun_of",
            field=models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name="reruns", to="pipeline.deploymentjob"),
        ),
        migrations.AddField(model_name="deploymentjob", name="package", field=models.JSONField(blank=True, default=dict)),
        migrations.AddField(model_name="deploymentjob", name="toolchain", field=models.JSONField(blank=True, default=dict)),
    ]
