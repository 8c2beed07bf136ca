from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('pipeline', '0009_acc_device_task_retime'),
    ]

    operations = [
        migrations.AddField(model_name='deploymentjob', name='support', field=models.JSONField(blank=True, default=dict)),
        migrations.AddField(model_name='devicetask', name='support', field=models.JSONField(blank=True, default=dict)),
    ]
