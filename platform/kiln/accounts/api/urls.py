from django.urls import path

from . import views

urlpatterns = [
    path("auth/csrf/", views.CsrfView.as_view(), name="auth-csrf"),
    path("auth/login/", views.LoginView.as_view(), name="auth-login"),
    path("auth/logout/", views.LogoutView.as_view(), name="auth-logout"),
    path("auth/signup/", views.SignupView.as_view(), name="auth-signup"),
    path("auth/me/", views.MeView.as_view(), name="auth-me"),
    path("auth/organization/", views.OrganizationSwitchView.as_view(), name="auth-organization"),
    path("members/", views.MemberListView.as_view(), name="members"),
    path("members/<id:pk>/", views.MemberDetailView.as_view(), name="member-detail"),
    path("tokens/", views.ApiTokenListView.as_view(), name="tokens"),
    path("tokens/<id:pk>/revoke/", views.ApiTokenRevokeView.as_view(), name="token-revoke"),
]
