import pytest
from pydantic import ValidationError

from app.builder import build_app, build_model_type
from app.config.service import ServiceConfig
from tests.conftest import app_args


def test_shipped_local_config_is_valid():
    shipped = ServiceConfig.model_validate(app_args(deployed=False))
    # `make run`'s fast type runs its engine in the ingress (app.serving.in_process).
    assert [m.name for m in shipped.model_types if m.in_ingress] == ["ServiceAi-Fast"]
    config = ServiceConfig.model_validate(app_args())
    assert [m.name for m in config.model_types] == [
        "ServiceAi-Fast",
        "ServiceAi-Pro",
        "ServiceAi-Coder",
        "ServiceAi-Embed",
    ]
    assert {m.model_env for m in config.model_types} == {
        "SERVICEAI_MODEL_FAST",
        "SERVICEAI_MODEL_PRO",
        "SERVICEAI_MODEL_CODER",
        "SERVICEAI_MODEL_EMBED",
    }


def test_builder_binds_ingress_and_one_deployment_per_type():
    application = build_app(app_args())
    ingress = application._bound_deployment
    assert ingress.name == "Ingress"
    models = ingress.init_args[1]
    assert sorted(models) == [
        "ServiceAi-Coder",
        "ServiceAi-Embed",
        "ServiceAi-Fast",
        "ServiceAi-Pro",
    ]
    assert models["ServiceAi-Pro"]._bound_deployment.name == "ServiceAi-Pro"


def test_wrong_config_fails_at_build_naming_the_field():
    args = app_args()
    args["model_types"][1]["max_ongoing_requests"] = "lots"
    with pytest.raises(ValidationError) as info:
        build_app(args)
    assert "model_types.1.max_ongoing_requests" in str(info.value)


def test_duplicate_model_types_are_refused():
    args = app_args()
    args["model_types"][1]["name"] = "ServiceAi-Fast"
    with pytest.raises(ValidationError, match="repeated"):
        ServiceConfig.model_validate(args)


@pytest.mark.parametrize(
    ("aliases", "refused"),
    [
        ({"claude-*": "ServiceAi-Nope"}, "not a model type"),
        ({"ServiceAi-Pro": "ServiceAi-Fast"}, "own name"),
    ],
)
def test_an_alias_must_name_a_model_type_and_shadow_none(aliases, refused):
    args = {**app_args(), "model_aliases": aliases}
    with pytest.raises(ValidationError, match=refused):
        ServiceConfig.model_validate(args)


def test_ingress_environment_goes_to_its_runtime_env():
    args = app_args()
    args["ingress"]["env_vars"] = {"SERVICEAI_DATABASE_URL": "${DATABASE_URL}"}
    ingress = build_app(args)._bound_deployment
    assert ingress.ray_actor_options["runtime_env"] == {
        "env_vars": {"SERVICEAI_DATABASE_URL": "${DATABASE_URL}"}
    }


def test_ingress_only_app_binds_no_model_deployment():
    args = dict(app_args(), models_app="serviceai")
    ingress = build_app(args)._bound_deployment
    assert ingress.init_args[1] is None


def test_separate_model_apps_binds_the_ingress_only_and_looks_each_type_up_by_its_name():
    args = dict(app_args(), separate_model_apps=True)
    ingress = build_app(args)._bound_deployment
    assert ingress.init_args[1] is None
    config = ingress.init_args[0]
    assert [config.model_type_app(m.name) for m in config.model_types] == [
        "ServiceAi-Fast",
        "ServiceAi-Pro",
        "ServiceAi-Coder",
        "ServiceAi-Embed",
    ]
    assert ServiceConfig.model_validate(app_args()).model_type_app("ServiceAi-Fast") is None


NAMES = ["ServiceAi-Fast", "ServiceAi-Pro", "ServiceAi-Coder", "ServiceAi-Embed"]


@pytest.mark.parametrize("elsewhere", [{"separate_model_apps": True}, {"models_app": "serviceai"}])
def test_names_will_do_where_another_application_deploys_the_types(elsewhere):
    config = ServiceConfig.model_validate(dict(app_args(), model_types=NAMES, **elsewhere))
    assert [m.name for m in config.model_types] == NAMES
    # The types' own applications say which scale to zero (Serve tells the ingress's handles).
    assert config.scale_to_zero_types() is None
    ingress = build_app(dict(app_args(), model_types=NAMES, **elsewhere))._bound_deployment
    assert ingress.init_args[1] is None


def test_names_and_entries_may_mix_where_another_application_deploys_the_types():
    args = dict(app_args(), separate_model_apps=True)
    args["model_types"] = ["ServiceAi-Fast", *args["model_types"][1:]]
    config = ServiceConfig.model_validate(args)
    assert [m.name for m in config.model_types] == NAMES


def test_names_are_refused_where_this_application_deploys_the_types():
    with pytest.raises(ValidationError) as info:
        ServiceConfig.model_validate(dict(app_args(), model_types=NAMES))
    [error] = info.value.errors()
    assert error["loc"] == ("model_types",)
    assert error["msg"] == (
        "Value error, 'ServiceAi-Fast' is a name only; this application deploys its model types,"
        " so each needs its whole entry (names only with separate_model_apps or models_app)"
    )


def test_scale_to_zero_types_where_this_application_deploys_them():
    args = app_args()
    args["model_types"][2]["autoscaling_config"] = {"min_replicas": 0, "max_replicas": 1}
    del args["model_types"][2]["num_replicas"]
    assert ServiceConfig.model_validate(args).scale_to_zero_types() == {"ServiceAi-Coder"}


def test_one_place_for_the_models():
    with pytest.raises(ValidationError, match="either models_app or separate_model_apps"):
        ServiceConfig.model_validate(dict(app_args(), models_app="x", separate_model_apps=True))


def test_model_type_application_is_the_model_deployment_with_its_options():
    fast = dict(app_args()["model_types"][0], max_surge_percent=25)
    placeholder = build_model_type(fast)._bound_deployment
    # The application's ingress is a placeholder: Serve refuses the model deployment's request
    # router on an application's ingress under HAProxy.
    assert placeholder.name == "ModelTypeApp"
    deployment = placeholder.init_args[0]._bound_deployment
    assert deployment.name == "ServiceAi-Fast"
    assert deployment._deployment_config.max_surge_percent == 25
    assert deployment.init_args[0].name == "ServiceAi-Fast"


def test_ingress_pinning_rollout_and_drain_options_reach_serve():
    args = app_args()
    args["ingress"].update(
        resources={"serviceai_ingress": 0.001},
        max_surge_percent=25,
        graceful_shutdown_timeout_s=600,
    )
    ingress = build_app(args)._bound_deployment
    assert ingress._replica_config.resource_dict == {"CPU": 0.25, "serviceai_ingress": 0.001}
    assert ingress._deployment_config.max_surge_percent == 25
    assert ingress._deployment_config.graceful_shutdown_timeout_s == 600


def test_every_plan_must_limit_every_served_type_and_free_must_exist():
    args = app_args()
    del args["plans"]["pro"]["ServiceAi-Coder"]
    with pytest.raises(ValidationError) as info:
        ServiceConfig.model_validate(args)
    assert "plan 'pro' gives no limits for model types ['ServiceAi-Coder']" in str(info.value)

    args = app_args()
    del args["plans"]["free"]
    with pytest.raises(ValidationError, match="plans must include 'free'"):
        ServiceConfig.model_validate(args)

    args = app_args()
    args["plans"]["free"]["ServiceAi-Pro"]["requests_per_minute"] = 0
    with pytest.raises(ValidationError) as info:
        ServiceConfig.model_validate(args)
    assert "plans.free.ServiceAi-Pro.requests_per_minute" in str(info.value)


def test_a_config_serving_fewer_types_keeps_the_full_plans():
    args = app_args()
    args["model_types"] = args["model_types"][:1]
    config = ServiceConfig.model_validate(args)
    assert config.plans.get("free").on("ServiceAi-Fast").requests_per_minute == 1000


def test_a_plan_names_its_priority_beside_its_limits():
    args = app_args()
    plans = ServiceConfig.model_validate(args).plans
    assert (plans.get("pro").priority, plans.get("free").priority) == (0, 10)
    assert "priority" not in plans.get("free").root  # not a model type
    del args["plans"]["pro"]["priority"]
    assert ServiceConfig.model_validate(args).plans.get("pro").priority == 0  # the default
    for wrong in (-1, 1.5, "high", 1001):
        args["plans"]["pro"]["priority"] = wrong
        with pytest.raises(ValidationError) as info:
            ServiceConfig.model_validate(args)
        assert "a plan's priority is a whole number from 0 (first) to 1000" in str(info.value)


def in_ingress_args(**ingress) -> dict:
    args = app_args()
    args["model_types"][0]["in_ingress"] = True
    args["ingress"].update(ingress)
    return args


def test_a_type_in_the_ingress_has_no_deployment_and_the_ingress_reserves_its_cpus():
    args = in_ingress_args()
    ingress = build_app(args)._bound_deployment
    assert sorted(ingress.init_args[1]) == ["ServiceAi-Coder", "ServiceAi-Embed", "ServiceAi-Pro"]
    fast = args["model_types"][0]
    assert ingress.ray_actor_options["num_cpus"] == args["ingress"]["num_cpus"] + fast["num_cpus"]


@pytest.mark.parametrize(
    ("change", "refused"),
    [
        ({"ingress": {"num_replicas": 2}}, "the ingress needs num_replicas: 1"),
        ({"separate_model_apps": True}, "not with models_app or separate_model_apps"),
        ({"fast": {"serving_processes": 2}}, r"remove \['serving_processes'\]"),
        ({"fast": {"autoscaling_config": {"min_replicas": 1}}}, "autoscaling_config"),
        ({"fast": {"num_replicas": 2}}, "num_replicas"),
    ],
)
def test_a_type_in_the_ingress_refuses_what_only_a_deployment_honours(change, refused):
    args = in_ingress_args(**change.get("ingress", {}))
    args["model_types"][0].pop("num_replicas", None)
    args["model_types"][0].update(change.get("fast", {}))
    args.update({k: v for k, v in change.items() if k not in ("ingress", "fast")})
    with pytest.raises(ValidationError, match=refused):
        ServiceConfig.model_validate(args)


def test_a_type_in_the_ingress_is_no_application_of_its_own():
    entry = {**app_args()["model_types"][0], "in_ingress": True}
    with pytest.raises(ValueError, match="in_ingress"):
        build_model_type(entry)
