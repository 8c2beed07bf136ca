from django.urls import path

from . import views

urlpatterns = [path("jobs/<id:pk>/report/", views.JobReportView.as_view(), name="job-report")]
