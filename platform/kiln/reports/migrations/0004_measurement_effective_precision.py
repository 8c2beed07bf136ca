from django.db import migrations, models


def backfill(apps, schema_editor):
    """Rows measured before effective precisions: name what each ran in from its precision and compile options."""
    from kiln_contract.labels import effective_precision, variant_label

    Measurement = apps.get_model("reports", "Measurement")
    for row in Measurement.objects.filter(effective_precision="").iterator():
        options = (row.compile_options or {}).get("options") or {}
        compile_options = options.get("compile") or {}
        row.effective_precision = effective_precision(row.precision, compile_options, row.backend, options)
        row.label = variant_label(key=row.variant_key, precision=row.precision, backend=row.backend, compile_options=compile_options,
                                  options=options)[:300]
        row.save(update_fields=["effective_precision", "label"])


class Migration(migrations.Migration):
    dependencies = [("reports", "0003_packagekey")]

    operations = [
        migrations.AddField(model_name="measurement", name="effective_precision",
                            field=models.CharField(blank=True, db_index=True, default="", max_length=32)),
        migrations.AddField(model_name="measurement", name="label", field=models.CharField(blank=True, default="", max_length=300)),
        migrations.AddField(model_name="measurement", name="recommended", field=models.BooleanField(default=False)),
        migrations.AddField(model_name="measurement", name="timing_source", field=models.CharField(blank=True, default="", max_length=32)),
        migrations.RunPython(backfill, migrations.RunPython.noop),
    ]
