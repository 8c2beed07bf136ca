import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('accounts', '0001_initial'),
        ('pipeline', '0010_operator_support'),
    ]

    operations = [
        migrations.AddField(model_name='deploymentjob', name='work_seconds', field=models.FloatField(default=0.0)),
        migrations.AddField(model_name='deploymentjob', name='waiting', field=models.JSONField(blank=True, default=dict)),
        migrations.AddField(model_name='deploymentjob', name='stage_offered_at', field=models.DateTimeField(blank=True, null=True)),
        migrations.AddField(model_name='variant', name='build_offered_at', field=models.DateTimeField(blank=True, null=True)),
        migrations.CreateModel(
            name='WorkSlot',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('work_class', models.CharField(max_length=8)),
                ('holder', models.CharField(max_length=200)),
                ('host', models.CharField(max_length=255)),
                ('expires_at', models.DateTimeField(db_index=True)),
                ('created_at', models.DateTimeField(auto_now_add=True)),
                ('job', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.CASCADE, related_name='+', to='pipeline.deploymentjob')),
                ('organization', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='+', to='accounts.organization')),
            ],
            options={'ordering': ['id'], 'indexes': [models.Index(fields=['work_class', 'organization'], name='pipeline_wo_work_cl_6d73a8_idx')]},
        ),
    ]
