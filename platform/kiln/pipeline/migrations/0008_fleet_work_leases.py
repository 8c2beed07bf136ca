from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('pipeline', '0007_pytorch_source_artifact'),
    ]

    operations = [
        migrations.AddField(model_name='deploymentjob', name='stage_task', field=models.CharField(blank=True, default='', max_length=16)),
        migrations.AddField(model_name='deploymentjob', name='stage_lease_owner', field=models.CharField(blank=True, default='', max_length=32)),
        migrations.AddField(model_name='deploymentjob', name='stage_lease_expires_at', field=models.DateTimeField(blank=True, db_index=True, null=True)),
        migrations.AddField(model_name='deploymentjob', name='stage_attempts', field=models.PositiveIntegerField(default=0)),
        migrations.AddField(model_name='variant', name='build_lease_owner', field=models.CharField(blank=True, default='', max_length=32)),
        migrations.AddField(model_name='variant', name='build_lease_expires_at', field=models.DateTimeField(blank=True, db_index=True, null=True)),
        migrations.AddField(model_name='variant', name='build_attempts', field=models.PositiveIntegerField(default=0)),
    ]
