package dev.redrive.neighbours;

import java.util.Collection;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.consumer.Consumer;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;
import org.springframework.beans.factory.annotation.Value;
import org.springframework.context.annotation.AnnotationConfigApplicationContext;
import org.springframework.context.annotation.Bean;
import org.springframework.context.annotation.Configuration;
import org.springframework.context.annotation.Import;
import org.springframework.core.env.MapPropertySource;
import org.springframework.kafka.annotation.BackOff;
import org.springframework.kafka.annotation.DltHandler;
import org.springframework.kafka.annotation.EnableKafka;
import org.springframework.kafka.annotation.EnableKafkaRetryTopic;
import org.springframework.kafka.annotation.KafkaListener;
import org.springframework.kafka.annotation.RetryableTopic;
import org.springframework.kafka.config.ConcurrentKafkaListenerContainerFactory;
import org.springframework.kafka.core.DefaultKafkaConsumerFactory;
import org.springframework.kafka.core.DefaultKafkaProducerFactory;
import org.springframework.kafka.core.KafkaAdmin;
import org.springframework.kafka.core.KafkaTemplate;
import org.springframework.kafka.listener.ConsumerAwareRebalanceListener;
import org.springframework.kafka.listener.DeadLetterPublishingRecoverer;
import org.springframework.kafka.listener.DefaultErrorHandler;
import org.springframework.scheduling.concurrent.ThreadPoolTaskScheduler;
import org.springframework.util.backoff.FixedBackOff;

/**
 * Two plain Spring (no Boot) applications with Spring Kafka, as their users write them:
 * a {@code @RetryableTopic} listener with its {@code @DltHandler}, and a listener whose
 * container has a {@code DefaultErrorHandler} with a {@code DeadLetterPublishingRecoverer}.
 * Arguments: BOOTSTRAP TOPIC GROUP. Both fail a record whose value starts with "fail".
 */
public final class SpringPrograms {
    private SpringPrograms() {}

    public static void retryableTopic(String[] args) throws InterruptedException {
        run(args, RetryableTopicApp.class);
    }

    public static void errorHandler(String[] args) throws InterruptedException {
        run(args, ErrorHandlerApp.class);
    }

    private static void run(String[] args, Class<?> app) throws InterruptedException {
        Map<String, Object> settings = new HashMap<>();
        settings.put("neighbour.bootstrap", Main.need(args, 0, "bootstrap servers"));
        settings.put("neighbour.topic", Main.need(args, 1, "topic"));
        settings.put("neighbour.group", Main.need(args, 2, "group"));
        AnnotationConfigApplicationContext context = new AnnotationConfigApplicationContext();
        context.getEnvironment().getPropertySources().addFirst(new MapPropertySource("args", settings));
        context.register(app);
        // SIGTERM closes the context: the listeners stop and leave their group.
        context.registerShutdownHook();
        context.refresh();
        Events.emit("started");
        Main.parkUntilStopped();
    }

    /** Where a listener read a record, by Spring's topic names (main, "-retry", "-dlt"). */
    static String kind(String topic, String mainTopic) {
        if (topic.equals(mainTopic)) {
            return "main";
        }
        if (topic.endsWith("-dlt") || topic.endsWith(".DLT")) {
            return "dlt";
        }
        return topic.contains("-retry") ? "retry" : "other";
    }

    static void handle(ConsumerRecord<byte[], byte[]> record, String mainTopic) {
        Map<String, Object> event = Events.record("listener", record);
        event.put("kind", kind(record.topic(), mainTopic));
        Events.emit(event);
        if (Main.fails(record.value())) {
            throw new IllegalStateException("refused " + Events.text(record.value()));
        }
    }

    /** The beans every Spring Kafka application declares: clients of byte arrays. */
    @Configuration
    @EnableKafka
    public static class KafkaBeans {
        @Value("${neighbour.bootstrap}")
        String bootstrap;

        @Bean
        public DefaultKafkaConsumerFactory<byte[], byte[]> consumerFactory() {
            Map<String, Object> config = new HashMap<>();
            config.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
            config.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
            config.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class);
            config.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class);
            return new DefaultKafkaConsumerFactory<>(config);
        }

        @Bean
        public KafkaTemplate<byte[], byte[]> kafkaTemplate() {
            Map<String, Object> config = new HashMap<>();
            config.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
            config.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class);
            config.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class);
            return new KafkaTemplate<>(new DefaultKafkaProducerFactory<>(config));
        }

        /** Creates the retry and dead-letter topics Spring declares. */
        @Bean
        public KafkaAdmin kafkaAdmin() {
            return new KafkaAdmin(Map.of(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap));
        }

        static ConcurrentKafkaListenerContainerFactory<byte[], byte[]> factory(
                DefaultKafkaConsumerFactory<byte[], byte[]> consumers) {
            ConcurrentKafkaListenerContainerFactory<byte[], byte[]> factory =
                    new ConcurrentKafkaListenerContainerFactory<>();
            factory.setConsumerFactory(consumers);
            factory.getContainerProperties().setConsumerRebalanceListener(new AssignmentEvents());
            return factory;
        }
    }

    /** Tells the harness which partitions a listener was given. */
    static final class AssignmentEvents implements ConsumerAwareRebalanceListener {
        @Override
        public void onPartitionsAssigned(Consumer<?, ?> consumer, Collection<TopicPartition> partitions) {
            List<String> names = partitions.stream().map(TopicPartition::toString).sorted().toList();
            Events.emit("assigned", "partitions", names);
        }
    }

    @Configuration
    @EnableKafkaRetryTopic
    @Import(KafkaBeans.class)
    public static class RetryableTopicApp {
        @Bean
        public ConcurrentKafkaListenerContainerFactory<byte[], byte[]> kafkaListenerContainerFactory(
                DefaultKafkaConsumerFactory<byte[], byte[]> consumers) {
            return KafkaBeans.factory(consumers);
        }

        /** What Boot would give: retry topics pause a partition until a retry falls due. */
        @Bean
        public ThreadPoolTaskScheduler taskScheduler() {
            return new ThreadPoolTaskScheduler();
        }

        @Bean
        public RetryableListener retryableListener() {
            return new RetryableListener();
        }
    }

    /** Two attempts: the main topic's, then one retry topic's; then the dead-letter topic. */
    public static class RetryableListener {
        @Value("${neighbour.topic}")
        String topic;

        @RetryableTopic(attempts = "2", backOff = @BackOff(delay = 200), kafkaTemplate = "kafkaTemplate")
        @KafkaListener(topics = "${neighbour.topic}", groupId = "${neighbour.group}")
        public void listen(ConsumerRecord<byte[], byte[]> record) {
            handle(record, topic);
        }

        @DltHandler
        public void dead(ConsumerRecord<byte[], byte[]> record) {
            Map<String, Object> event = Events.record("dlt_handler", record);
            event.put("kind", kind(record.topic(), topic));
            Events.emit(event);
        }
    }

    @Configuration
    @Import(KafkaBeans.class)
    public static class ErrorHandlerApp {
        /** One delivery, no retry in place (FixedBackOff(0, 1): one more try, at once), then
         * the recoverer publishes the record to Spring's default dead-letter topic. */
        @Bean
        public ConcurrentKafkaListenerContainerFactory<byte[], byte[]> kafkaListenerContainerFactory(
                DefaultKafkaConsumerFactory<byte[], byte[]> consumers,
                KafkaTemplate<byte[], byte[]> template) {
            ConcurrentKafkaListenerContainerFactory<byte[], byte[]> factory = KafkaBeans.factory(consumers);
            DeadLetterPublishingRecoverer recoverer = new DeadLetterPublishingRecoverer(template);
            factory.setCommonErrorHandler(new DefaultErrorHandler(recoverer, new FixedBackOff(0, 1)));
            return factory;
        }

        @Bean
        public PlainListener plainListener() {
            return new PlainListener();
        }
    }

    public static class PlainListener {
        @Value("${neighbour.topic}")
        String topic;

        @KafkaListener(topics = "${neighbour.topic}", groupId = "${neighbour.group}")
        public void listen(ConsumerRecord<byte[], byte[]> record) {
            handle(record, topic);
        }
    }
}
