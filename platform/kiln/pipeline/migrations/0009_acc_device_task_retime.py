from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('pipeline', '0008_fleet_work_leases'),
    ]

    operations = [
        migrations.AddField(model_name='devicetask', name='purpose',
                            field=models.CharField(choices=[('measure', 'Measure'), ('retime', 'Retime')], default='measure', max_length=8)),
        migrations.AddField(model_name='devicetask', name='retime', field=models.JSONField(blank=True, default=dict)),
        migrations.RemoveConstraint(model_name='devicetask', name='one_task_per_cell'),
        migrations.AddConstraint(model_name='devicetask', constraint=models.UniqueConstraint(
            fields=('job', 'variant', 'backend', 'target', 'purpose'), name='one_task_per_cell')),
    ]
